"""``python -m sglab.sglang.gpu record ...``: see :mod:`sglab.sglang.gpu.record`."""

import sys

from sglab.sglang.gpu.record import main

sys.exit(main())
