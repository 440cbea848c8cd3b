# Temporary alias of core.logs (moved there), for branches started before the move.
import sys

from core import logs as _moved

sys.modules[__name__] = _moved
