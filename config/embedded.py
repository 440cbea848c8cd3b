# Temporary alias of core.embedded (moved there), for branches started before the move.
import sys

from core import embedded as _moved

sys.modules[__name__] = _moved
