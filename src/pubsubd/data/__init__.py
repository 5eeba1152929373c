"""pubsubd."""
