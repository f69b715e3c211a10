"""python -m training.corpus [options]: the same as `nmt corpus`."""

import argparse
import sys

from training.corpus.build import register

parser = argparse.ArgumentParser(prog="python -m training.corpus")
register(parser.add_subparsers(dest="cmd"))
args = parser.parse_args(sys.argv[1:] if sys.argv[1:2] == ["corpus"] else ["corpus", *sys.argv[1:]])
args.func(args)
