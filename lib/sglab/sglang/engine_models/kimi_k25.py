"""0.5.12.post1's ``KimiK25ForConditionalGeneration`` plus only 0.5.13's ``post_load_weights``
(adjustment ``kimi-k25-post-load-weights``): with dummy weights, without it the DeepSeek-V3
language model never absorbs the MLA weights. #26382's own changes are left out."""

from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration as _Released


class KimiK25ForConditionalGeneration(_Released):

    def post_load_weights(self):
        if self.language_model is not None:
            self.language_model.post_load_weights()


EntryClass = KimiK25ForConditionalGeneration
