"""``pubsubd prober``: probes the service the way clients use it (issue 12)."""
