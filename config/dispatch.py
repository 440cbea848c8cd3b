# Temporary alias of core.dispatch (moved there), for branches started before the move.
import sys

from core import dispatch as _moved

sys.modules[__name__] = _moved
