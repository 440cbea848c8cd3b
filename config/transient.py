# Temporary alias of core.transient (moved there), for branches started before the move.
import sys

from core import transient as _moved

sys.modules[__name__] = _moved
