# Temporary alias of core.tracing (moved there), for branches started before the move.
import sys

from core import tracing as _moved

sys.modules[__name__] = _moved
