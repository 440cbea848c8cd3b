# Temporary alias of core.middleware (moved there), for branches started before the move.
import sys

from core import middleware as _moved

sys.modules[__name__] = _moved
