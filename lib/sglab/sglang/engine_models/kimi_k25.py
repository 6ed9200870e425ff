"""0.5.12.post1's ``KimiK25ForConditionalGeneration`` plus only 0.5.13's ``post_load_weights``.

Harness adjustment ``kimi-k25-post-load-weights`` (:mod:`sglab.sglang.engine`). With ``--load-format
dummy`` the model loader initialises the weights and then calls ``post_load_weights`` where the
model has one; the released 0.5.12.post1 wrapper has none, so its DeepSeek-V3 language model never
absorbs the MLA weights (``w_kc`` stays None and the first decode dies). 0.5.13 added exactly this
method (#26382 is the other half of that change: the
``model`` property and the ``__setattr__`` guard, which this subclass deliberately leaves out, so
the released piecewise-CUDA-graph gate of 0.5.12.post1 is what runs).
"""

from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration as _Released


class KimiK25ForConditionalGeneration(_Released):

    def post_load_weights(self):
        if self.language_model is not None:
            self.language_model.post_load_weights()


EntryClass = KimiK25ForConditionalGeneration
