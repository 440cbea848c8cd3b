from django.apps import AppConfig


class RuntimeConfig(AppConfig):
    name = "runtime"

    def ready(self) -> None:
        # The "interrupt" busy policy's request, which admission (below the
        # runtime) makes after its commit.
        from tickets import superseding

        from .turns import supersede_turn

        superseding.register(supersede_turn)
