from django.apps import AppConfig


class RuntimeConfig(AppConfig):
    name = "runtime"

    def ready(self) -> None:
        # The "interrupt" busy policy's request, which admission (below the
        # runtime) makes after its commit.
        from tickets import superseding
        from tickets.turns import interrupt

        from .turns import supersede_turn
        from .turns.budgets import cancel_http_turn

        superseding.register(supersede_turn)
        # An interrupt's step that is execution: an http agent's cancel URL.
        interrupt.on_interrupt(cancel_http_turn)
