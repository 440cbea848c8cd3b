# Temporary alias of core.outbound (moved there), for branches started before the move.
import sys

from core import outbound as _moved

sys.modules[__name__] = _moved
