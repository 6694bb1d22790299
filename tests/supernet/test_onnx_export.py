import torch

from search_spaces import Subnet
from supernet import SuperTransformer, extract
from supernet.onnx_export import export_onnx, onnx_parity, op_counts


def test_onnx_round_trip_every_type_with_fused_softmax(tiny, tmp_path):
    model = SuperTransformer(tiny, generator=torch.Generator().manual_seed(0)).eval()
    subnet = Subnet(96, 3, (4, 2, 1), (512, 256, 128), ("softmax", "local:32", "linear"))
    static = extract(model, subnet)
    path = export_onnx(static, tmp_path / "m.onnx")
    counts = op_counts(path)
    assert counts["Attention"] == 1  # the softmax layer, one fused node
    assert counts["Softmax"] == 1  # the local layer: block-local MatMul / Softmax nodes, O(T * W), no dense mask
    assert counts["LayerNormalization"] == 2 * subnet.depth + 1
    g = torch.Generator().manual_seed(1)
    for shape in [(1, 7), (3, 100), (2, tiny.max_seq_len)]:  # dynamic batch and sequence axes
        assert onnx_parity(path, static, torch.randint(0, 256, shape, generator=g)) <= 1e-4
