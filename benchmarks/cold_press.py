"""A link on a cold process, then the buttons a visitor presses (Streamlit's AppTest, in this process): an empty
results store, an empty XLA compile cache, nothing imported yet.

    python -m benchmarks.cold_press                       # Gradient norms, SimpleCNN on Fashion-MNIST: "Train the model"
    python -m benchmarks.cold_press --page dp_clipping    # then the DP-SGD section's button, with the page's defaults

Prints each step's wall seconds and this process's CPU-seconds (all of XLA's threads), with the load average, and
the page's metrics after each press. `benchmarks.cold_page` is the same link in a real browser, before any press.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def since(start) -> str:
    return (f"{time.perf_counter() - start[0]:.1f} s wall, {time.process_time() - start[1]:.1f} CPU-s "
            f"(load average {os.getloadavg()[0]:.1f})")


def show(at) -> None:
    """The page's metrics and any warning or error, one a line."""
    assert not at.exception, [e.value for e in at.exception]
    for m in at.metric:
        print(f"    {m.label}: {m.value}")
    for box in (*at.warning, *at.error):
        print(f"    {type(box).__name__}: {box.value[:300]}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", default="norms", choices=("norms", "dp_clipping"))
    ap.add_argument("--query", default="dataset=fashion&model=simple_cnn")
    a = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="gradlab-cold-press-")
    os.environ["GRADLAB_STORE_DIR"] = f"{tmp}/store"  # before gradlab or JAX is imported
    os.environ["JAX_COMPILATION_CACHE_DIR"] = f"{tmp}/xla"
    if "jax" in sys.modules:
        raise SystemExit("run this in a fresh process (JAX is imported already)")
    from streamlit.testing.v1 import AppTest

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(root)
    start = time.perf_counter(), time.process_time()
    at = AppTest.from_file(os.path.join(root, "app.py"), default_timeout=900)
    for key, value in (kv.split("=", 1) for kv in a.query.split("&")):
        at.query_params[key] = value
    at.run()
    at.switch_page(f"views/{a.page}.py").run()
    print(f"{a.page}?{a.query}, cold: the link {since(start)}; buttons: {[b.label for b in at.button]}", flush=True)
    show(at)
    start = time.perf_counter(), time.process_time()
    at.button(key="run_train").click().run()
    print(f"after 'Train the model': {since(start)}", flush=True)
    show(at)
    if a.page == "dp_clipping":
        print("    " + next((c.value for c in at.caption if c.value.startswith("σ =")), "(no σ caption)"))
        start = time.perf_counter(), time.process_time()
        at.button(key="run_dp_sgd").click().run()
        print(f"after the DP-SGD button: {since(start)}", flush=True)
        show(at)


if __name__ == "__main__":
    main()
