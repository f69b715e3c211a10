"""Offline tooling that makes and measures a model: the corpus from Debian packages
(`corpus`), training (`train`) and evaluation (`evaluate`). The service never imports it."""
