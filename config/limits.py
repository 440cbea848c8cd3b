# Temporary alias of core.limits (moved there), for branches started before the move.
import sys

from core import limits as _moved

sys.modules[__name__] = _moved
