# No models: API keys are accounts.ApiKey (accounts/models.py).
