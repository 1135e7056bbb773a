"""The pre-norm decoder layer every family's GPU forward is made of:

    x += mixer(norm(x))        attention, latent attention, a recurrent mixer, ...
    x += ffn(norm(x))          a gated FFN, routed experts, experts with a shared one, ...

or, with post-norms (Gemma's "sandwich"), x += post_norm(mixer(norm(x))) and the same for the
FFN, each post-norm, its residual add and the next block's pre-norm in one kernel.

A family declares what differs (GpuModel.decoder_layer): its mixer and FFN blocks and the names
of its norm tensors. A block is called as block(batch, input, out, accumulate) and reads its
own weights in bind(model, il); `fold_input = False` on an FFN makes the pre-norm write the
normalized copy instead of folding it into the matrix kernels (blocks that read the input while
others add into x).
"""

from __future__ import annotations

from ..modelfile import tensor_names as T
from .blocks import Batch, Residual


class DecoderLayer:
    def __init__(self, mixer, ffn, attn_norm: str = T.ATTN_NORM, ffn_norm: str = T.FFN_NORM,
                 post_norms: tuple[str, str] | None = None):
        self.mixer, self.ffn = mixer, ffn
        self.names = (attn_norm, ffn_norm)
        self.post_names = post_norms
        self.attn_norm = self.ffn_norm = self.post_attn_norm = self.post_ffn_norm = 0  # device pointers, at bind

    def bind(self, model, il: int) -> None:
        r = model.tensors
        self.attn_norm, self.ffn_norm = (r.vector(T.blk(il, name)) for name in self.names)
        if self.post_names:  # optional in the file: a norm weight of 0 is none
            self.post_attn_norm, self.post_ffn_norm = (r.vector(T.blk(il, name), False) for name in self.post_names)
        self.mixer.bind(model, il)
        self.ffn.bind(model, il)

    def unread_bytes(self) -> int:
        """Weight bytes a token does not read (routed experts not chosen)."""
        return sum(getattr(block, "unread_bytes", lambda: 0)() for block in (self.mixer, self.ffn))

    def __call__(self, res: Residual, b: Batch, next_norm: int = 0, next_mixer=None) -> None:
        """This layer over batch b; next_norm: the next layer's pre-norm weight (post-norm layers
        leave norm(x) for it in the same kernel), 0 after the last layer; next_mixer: that layer's
        mixer (a post-norm may be folded into its first matrix kernel when it takes one)."""
        if self.post_names:
            self.mixer(b, res.normed(b, self.attn_norm), res.o, accumulate=False)
            res.add_normed(b, res.o, self.post_attn_norm, next_w=self.ffn_norm, fold=_takes_post(self.ffn, b))
            self.ffn(b, res.normed(b, self.ffn_norm), res.o, accumulate=False)
            res.add_normed(b, res.o, self.post_ffn_norm, next_w=next_norm,
                           fold=next_mixer is not None and _takes_post(next_mixer, b))
            return
        self.mixer(b, res.normed(b, self.attn_norm), res.x, accumulate=True)
        res.added()
        self.ffn(b, res.normed(b, self.ffn_norm, fold=getattr(self.ffn, "fold_input", True)), res.x, accumulate=True)
        res.added()


def _takes_post(block, b: Batch) -> bool:
    """Whether the block's first matrix kernel folds the previous post-norm in (Input.post)."""
    takes = getattr(block, "takes_post", None)
    return takes is not None and takes(b)
