# Temporary alias of core.append_only (moved there), for branches started before the move.
import sys

from core import append_only as _moved

sys.modules[__name__] = _moved
