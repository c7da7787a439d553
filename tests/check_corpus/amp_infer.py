"""Batch inference with bf16 autocast, written against CUDA with import aliases."""

import torch as th
from torch import cuda
from torch.cuda import amp

th.backends.cuda.matmul.allow_tf32 = True  # expect: FL040
th.backends.cudnn.allow_tf32 = True  # expect: FL041
DTYPE = th.bfloat16 if cuda.is_bf16_supported() else th.float16  # expect: FL027


def load(path: str) -> th.nn.Module:
    state = th.load(path, map_location="cuda:0")  # expect: FL004
    model = th.nn.Linear(8, 8)
    model.load_state_dict(state)
    return model.eval().to("cuda")  # expect: FL001


@th.inference_mode()
def predict(model: th.nn.Module, batch: th.Tensor) -> th.Tensor:
    if not batch.is_cuda:  # expect: FL011
        batch = batch.cuda()  # expect: FL010
    with th.autocast("cuda", dtype=DTYPE):  # expect: FL003
        out = model(batch)
    with amp.autocast(dtype=DTYPE):  # expect: FL028
        out = out + model(batch)
    return out.float().cpu()


def predict_legacy(model: th.nn.Module, batch: th.Tensor) -> th.Tensor:
    with th.amp.autocast(device_type="cuda"):  # expect: FL003
        return model(batch.to(device="cuda"))  # expect: FL001


if __name__ == "__main__":
    m = load("model.pt")
    print(predict(m, th.randn(4, 8)).shape, "inference on cuda done")
