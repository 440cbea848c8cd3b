# Temporary alias of core.fairshare (moved there), for branches started before the move.
import sys

from core import fairshare as _moved

sys.modules[__name__] = _moved
