# Temporary alias of core.listen (moved there), for branches started before the move.
import sys

from core import listen as _moved

sys.modules[__name__] = _moved
