# Temporary alias of core.readonly_admin (moved there), for branches started before the move.
import sys

from core import readonly_admin as _moved

sys.modules[__name__] = _moved
