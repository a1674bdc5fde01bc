"""PyTorch baselines beside cuplan's gpu-check, on the same GPU in the same run.

The shared models' architectures, built the way the ONNX files were exported (torchvision and transformers,
random initialisation, nothing downloaded) at the same shapes (images 1x3x224x224, bert input_ids 1x128), timed
in PyTorch eager mode and as one captured CUDA graph (torch.cuda.CUDAGraph), f32 with TF32 off (cuplan's
kernels compute in plain f32) and fp16. Each figure is the median of RUNS executions after WARMUP, bracketed by
CUDA events, as gpu-check times cuplan. Kernel launches per forward are counted with the profiler.

Written into the bundle by `cargo xtask gpu-check --prepare`; run.sh runs it when python3 has torch and a GPU.
Usage: python3 torch_baseline.py [--out FILE.md] [--runs N]
"""

import argparse
import statistics
import sys

RUNS = 100
WARMUP = 10


def median_us(fn, runs):
    import torch

    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(runs):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def graphed(fn):
    """fn captured once into a CUDA graph (static inputs), after warm-up on a side stream."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def launches(fn):
    """CUDA kernels (and memcpys/memsets) one call of fn launches, from the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def models():
    import torch
    import torchvision

    yield "resnet50", torchvision.models.resnet50(weights=None), torch.randn(1, 3, 224, 224)
    yield "mobilenet_v2", torchvision.models.mobilenet_v2(weights=None), torch.randn(1, 3, 224, 224)
    yield "googlenet", torchvision.models.googlenet(weights=None, aux_logits=False, init_weights=True), torch.randn(
        1, 3, 224, 224
    )
    try:
        from transformers import BertConfig, BertModel

        yield "bert_base", BertModel(BertConfig()), torch.randint(0, 30522, (1, 128))
    except Exception as e:  # transformers missing or changed: say so, keep the others
        print(f"torch_baseline: bert_base skipped: {e}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--runs", type=int, default=RUNS)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("torch_baseline: no GPU visible to torch: skipped")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    lines = [
        f"## PyTorch {torch.__version__} on {torch.cuda.get_device_name(0)} (cuDNN {torch.backends.cudnn.version()}, "
        f"TF32 off; median of {args.runs} after {WARMUP}, CUDA events)",
        "",
        "| model | dtype | launches | eager us | CUDA graph us |",
        "|---|---|---|---|---|",
    ]
    for name, model, x in models():
        for dtype in (torch.float32, torch.float16):
            try:
                m = model.to("cuda", dtype=dtype).eval()
                xi = x.cuda() if x.dtype == torch.int64 else x.to("cuda", dtype=dtype)
                with torch.inference_mode():
                    fn = lambda: m(xi)  # noqa: E731
                    eager = median_us(fn, args.runs)
                    count = launches(fn)
                    replay = median_us(graphed(fn), args.runs)
                row = f"| {name} | {str(dtype).removeprefix('torch.')} | {count} | {eager:.1f} | {replay:.1f} |"
            except Exception as e:  # one failure (capture refused, say) costs one row
                row = f"| {name} | {str(dtype).removeprefix('torch.')} | error: {str(e).splitlines()[0][:120]} | | |"
            print(row, flush=True)
            lines.append(row)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
