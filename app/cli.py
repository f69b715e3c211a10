"""The `nmt` console script: the model commands plus `serve`."""

from __future__ import annotations

import sys

from model.cli import build_parser


def serve_command(args) -> None:
    from app.serve import serve

    serve(args.host, args.port, args.model or None)


def main(argv: list[str] | None = None) -> None:
    parser, subparsers = build_parser()
    p = subparsers.add_parser("serve", help="serve the HTTP API (default: the shipped en-de model)")
    p.add_argument("--host", default=None, help="bind address (default: NMT_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default: NMT_PORT or 8000)")
    p.add_argument("--model", action="append", help="checkpoint directory; repeat for several models")
    p.set_defaults(func=serve_command)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"nmt: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
