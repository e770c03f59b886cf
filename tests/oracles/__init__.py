"""Shared pieces of the tests that compare our searches with an independent implementation (mctx)."""
