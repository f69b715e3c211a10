"""The `nmt` console script: the model commands (model/cli.py: translate, import-*), the offline
tooling's (training/: corpus, train, eval, ...) and the service's (app/: serve, keys), siblings.

`nmt serve` and `nmt keys` parse their own options without loading the other commands: the server
process never imports torch (the worker processes do), and the training commands would bring it in."""

from __future__ import annotations

import argparse
import sys


def serve_command(args) -> None:
    from app.serve import serve

    serve(args.host, args.port, args.model or None)


def add_serve_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=None, help="bind address (default: NMT_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default: NMT_PORT or 8000)")
    p.add_argument("--model", action="append", help="checkpoint directory; repeat for several models")
    p.set_defaults(func=serve_command)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        parser = argparse.ArgumentParser(prog="nmt serve", description="serve the HTTP API")
        add_serve_options(parser)
        argv = argv[1:]
    elif argv[:1] == ["keys"]:
        from app.keys import add_keys_options

        parser = argparse.ArgumentParser(prog="nmt keys", description="manage the API keys and their limits")
        add_keys_options(parser)
        argv = argv[1:]
    else:
        from model.cli import build_parser
        from training import backtranslate, corpus, evaluate, shortlist, terms_eval, train, tune

        parser, subparsers = build_parser()
        for module in (corpus, backtranslate, train, evaluate, tune, terms_eval, shortlist):  # the offline tooling's commands
            module.register(subparsers)
        add_serve_options(subparsers.add_parser("serve", help="serve the HTTP API (default: the shipped en-de model)"))
        from app.keys import add_keys_options

        add_keys_options(subparsers.add_parser("keys", help="manage the API keys and their limits (NMT_KEYS_DB)"))
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"nmt: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
