# Temporary alias of core.schemas (moved there), for branches started before the move.
import sys

from core import schemas as _moved

sys.modules[__name__] = _moved
