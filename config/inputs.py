# Temporary alias of core.inputs (moved there), for branches started before the move.
import sys

from core import inputs as _moved

sys.modules[__name__] = _moved
