from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_delete, post_save

        from .keys import key_cache
        from .models import ApiKey

        # A key or a user changed through the app (revoked, deactivated, made
        # or unmade staff, deleted): this process forgets what it cached at
        # once; other processes within API_KEY_CACHE_S (accounts/keys.py).
        def _forget_key(sender, instance, **kwargs):
            key_cache.forget_key(instance.key_hash)

        def _forget_user(sender, instance, **kwargs):
            key_cache.forget_user(instance.pk)

        for name, signal in (("save", post_save), ("delete", post_delete)):
            signal.connect(_forget_key, sender=ApiKey, weak=False, dispatch_uid=f"key-cache-{name}")
            signal.connect(
                _forget_user, sender=get_user_model(), weak=False, dispatch_uid=f"user-cache-{name}"
            )
