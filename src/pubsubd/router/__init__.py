"""The router process (issue 11): see main.py."""
