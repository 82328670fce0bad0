"""Framework adapters, one optional extra each (see the package README)."""
