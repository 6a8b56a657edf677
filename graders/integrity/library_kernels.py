"""Torch's own routines for the answers several notebooks build, declared once for their checks
(`Forbidden.kernels`, refused at the dispatcher by graders.integrity.kernels; `Forbidden.library_code`,
torch's Python versions, refused by the profiler of graders.integrity.provenance)."""

# torch's Python reference implementations (torch._refs, its decompositions and primitives): in
# eager mode they compute with ordinary operators, so only their Python code gives them away.
TORCH_REFERENCES = ("torch._refs", "torch._decomp", "torch._prims")

# Normalisations: layer norm itself, and the others that compute it once the input is reshaped
# (a group norm of one group, a batch or instance norm over the transposed input, an RMS norm of
# the centred input).
RMS_NORM_KERNELS = ("aten::rms_norm", "aten::_fused_rms_norm")
NORMALISATION_KERNELS = ("aten::layer_norm", "aten::native_layer_norm", "aten::group_norm", "aten::native_group_norm",
                         "aten::batch_norm", "aten::native_batch_norm", "aten::_native_batch_norm_legit*",
                         "aten::_batch_norm*", "aten::instance_norm", *RMS_NORM_KERNELS)
RMS_NORM_CODE = ("torch.nn.functional:rms_norm", "torch.nn.modules.normalization:RMSNorm", *TORCH_REFERENCES)

# Attention: scaled dot-product attention in every backend, and the multi-head module's kernel.
ATTENTION_KERNELS = ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_*",
                     "aten::_native_multi_head_attention", "aten::_transformer_encoder_layer_fwd")
ATTENTION_CODE = ("torch.nn.functional:multi_head_attention_forward", "torch.nn.modules.activation:MultiheadAttention",
                  *TORCH_REFERENCES)

GELU_KERNELS = ("aten::gelu",)

# The losses: cross-entropy and the negative log-likelihood it ends in (log-softmax is not among
# them: notebook 13's loss is built from it).
LOSS_KERNELS = ("aten::cross_entropy_loss", "aten::nll_loss*")

# What correct answers, or the course's code a check runs, may run though another exercise of their
# notebook refuses it (`Guard.may_run`): a model's attention, F.cross_entropy, clip_grad_norm_.
SOFTMAX_RUNS = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax")
CROSS_ENTROPY_RUNS = ("aten::cross_entropy_loss", "aten::log_softmax", "aten::_log_softmax", "aten::nll_loss_nd",
                      "aten::nll_loss", "aten::nll_loss_forward")
CLIP_GRAD_RUNS = ("aten::_foreach_norm", "aten::_foreach_mul_")

EMBEDDING_KERNELS = ("aten::embedding",)
LINEAR_KERNELS = ("aten::linear",)
# nn.TransformerEncoderLayer: its fast path's kernel, and its Python code.
ENCODER_LAYER_KERNELS = ("aten::_transformer_encoder_layer_fwd",)
ENCODER_LAYER_CODE = ("torch.nn.modules.transformer", *TORCH_REFERENCES)
