# Temporary alias of core.sqlfunctions (moved there), for branches started before the move.
import sys

from core import sqlfunctions as _moved

sys.modules[__name__] = _moved
