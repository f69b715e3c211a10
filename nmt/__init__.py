"""The `nmt` command (nmt/cli.py): one home above the three packages it dispatches to, which stand
beside each other: model/ (translate, import-*), training/ (corpus, train, eval, ...) and app/
(serve, keys)."""
