"""The ground floor: what every app uses. It imports no app and nothing of
config/ (the composition root above every app)."""
