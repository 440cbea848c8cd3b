# Temporary alias of core.canonical (moved there), for branches started before the move.
import sys

from core import canonical as _moved

sys.modules[__name__] = _moved
