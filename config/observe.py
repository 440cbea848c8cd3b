# Temporary alias of core.observe (moved there), for branches started before the move.
import sys

from core import observe as _moved

sys.modules[__name__] = _moved
