# Temporary alias of core.errors (moved there), for branches started before the move.
import sys

from core import errors as _moved

sys.modules[__name__] = _moved
