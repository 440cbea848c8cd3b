# No models. The module exists because Django sends post_migrate only to apps
# that have one, and config/apps.py grants privileges on that signal.
