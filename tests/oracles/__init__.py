"""Shared pieces of the tests that check the package against an independent reading: our searches against
mctx, losses written out by hand, replay streams read back from the buffer."""
