"""`python -m nmt ...`: the `nmt` command."""

from nmt.cli import main

main()
