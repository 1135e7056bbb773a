"""Qwen3-MoE in numpy (the layer diagram, routing rule and llama.cpp's conventions are in
config.py): Qwen3's layer with the routed experts as its FFN."""

from __future__ import annotations

import numpy as np

from ...modelfile import tensor_names as T
from ...reference import blocks, layers
from ..qwen3.reference import Qwen3


class Qwen3Moe(Qwen3):
    def ffn(self, il: int, h: np.ndarray) -> np.ndarray:
        e = self.config.extra
        logits = layers.linear(h, self.w.get(T.blk(il, T.FFN_ROUTER)))
        ids, weights = blocks.softmax_topk(logits, e["n_expert_used"], e["norm_topk_prob"])
        self.note_route_margin(blocks.topk_margin(logits, e["n_expert_used"]))
        return blocks.routed_experts(h, ids, weights, blocks.swiglu_expert(self, il))
