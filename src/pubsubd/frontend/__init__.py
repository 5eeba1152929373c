"""The frontend process (issue 11): a stateless proxy in front of the forwarders; see main.py."""
