"""Accounts: API keys and how a request proves it holds one. Below every
app that serves the API; imports only core."""
