"""Shared test helpers: an AppTest factory that opens one page with sidebar settings."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from benchmarks.browser import CHROMIUM

# One XLA compilation cache on disk for the whole run: page scripts rebuild their closures on every
# rerun and every browser test starts a fresh server, so the same programs would compile again and
# again. Set before JAX is imported; the streamlit servers inherit it through the environment.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(tempfile.gettempdir()) / "gradlab-test-xla-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
# The same bound as app.py's in every process, not only in the servers: a bounded cache takes a file lock around each
# read and write and keeps an access-time file beside each entry. A worker without the bound wrote entries with no
# access-time file, and every later write of a server then failed (its eviction scan reads every entry's file: 43 of
# one server's writes in one suite were lost, so the next server compiled those programs again); and an unlocked
# read could meet an entry another process was still writing.
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(512 * 2**20))

# A test worker holds many tests' programs (well over the server's 400 MB default): dropping JAX's compiled
# functions after every shared computation would make every later test trace and load its programs again.
os.environ.setdefault("GRADLAB_MEMORY_BUDGET_MB", "0")
# For the same reason the gate must not relieve memory before each computation (it would: a test worker is over the
# server's 600 MB budget plus a computation's estimate), which drops compiled programs and collects everything too.
# tests/test_figures.py and tests/test_store.py test the relief and the collection themselves; the browser test that
# holds a server to 690 MB sets the deployed budget. Page tests with the relief: 35% more CPU
# (tests/test_pages_norms.py and test_pages_dp.py: 21.3 against 13.7 CPU-s).
os.environ.setdefault("GRADLAB_SERVER_BUDGET_MB", "1000000")

# The engine's one-off timing of the rules against vmap on small computations (engine.AUTO_TIMING) would compile
# vmap as well in every test at N >= 64: it changes only the time, never a number. Off in tests (and in the
# servers they start); tests/test_engine.py turns it on to test it.
os.environ.setdefault("GRADLAB_AUTO_TIMING", "0")

# Most of a cold run is XLA compiling small programs, which LLVM's optimization passes dominate: without them the
# quick subset compiles about a quarter faster, at the price of slower loops in the few tests whose time is compute
# (SimpleCNN's training, the largest links). Numbers are unchanged: every oracle runs in the same process. The
# extreme-links browser test gives its server the default level: it measures the memory a user's server takes.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
# And the server's lean compiles (`memory.lean_compiles`: XLA:CPU's loop emitters where this jaxlib has the switch,
# jaxlib 0.10), which compile these programs with about 40% less CPU (tests/test_engine.py, test_pages_norms.py,
# test_pages_dp.py and test_influence_methods.py from an empty cache: 60–73 against 39–43 user CPU-s). Set before any
# worker starts a backend; the servers the tests start inherit it.


def pytest_configure(config):
    """Lean compiles in every process that runs tests. Not in pytest-xdist's controller, which runs none: importing
    gradlab there (JAX with it) and trying the flags cost ~2.3 s before any worker started (`-n 2`: the quick
    subset's fixed cost 11.4–11.7 → 9.3–9.4 s wall); each worker tries them itself, side by side."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    from gradlab import memory

    memory.lean_compiles()

# JAX's announced future forms (`GRADLAB_JAX_FLAGS=jax_remat3,jax_custom_vjp3`, a comma-separated list of boolean JAX
# config flags turned on for the whole run; .ci/run's newest-JAX lane runs the engine zoo and the users' model set so).
# A flag this JAX does not have is an error here, never a silent no-op.
JAX_FLAGS = tuple(f.strip() for f in os.environ.get("GRADLAB_JAX_FLAGS", "").split(",") if f.strip())
if JAX_FLAGS:
    import jax

    for _flag in JAX_FLAGS:
        jax.config.update(_flag, True)  # AttributeError: Unrecognized config option

# Opening a lecture room or its speaker view starts the lecture's warm-up (a walk over every step inside the server,
# minutes of CPU): not in tests, which open rooms by the dozen; tests/test_rooms.py turns it on to test it.
os.environ.setdefault("GRADLAB_AUTO_WARMUP", "0")

# A fresh results store per test process: a test must compute, never read a result a previous run stored.
os.environ["GRADLAB_STORE_DIR"] = tempfile.mkdtemp(prefix="gradlab-test-store-")
# ... and gone when the process ends: a whole suite leaves hundreds of them (GBs of /tmp over a few runs) otherwise.
atexit.register(shutil.rmtree, os.environ["GRADLAB_STORE_DIR"], ignore_errors=True)
# Practice's sandbox children at nice 10, not in the idle class (the server's default): two workers keep both cores
# busy, and an idle-class child would wait for a free core past its wall clock (test_practice_sandbox checks "idle").
os.environ.setdefault("GRADLAB_PRACTICE_PRIORITY", "10")

ROOT = Path(__file__).resolve().parents[1]
os.chdir(ROOT)

# Small, fast experiments for page tests: the sidebar keys are the Experiment's field names.
FAST = dict(steps=50, checkpoint_every=25)


def open_page(page: str, timeout: float = 300, **sidebar):
    """Run app.py, switch to `views/<page>.py`, apply sidebar values (by widget key), run again.

    Sidebar controls are set through `session_state` (their widget keys are the Experiment's field
    names), which is what a user's change does.
    """
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
    at.run()
    at.switch_page(f"views/{page}.py")
    for key, value in sidebar.items():
        at.session_state[key] = value
    at.run()
    return at


def assert_clean(at):
    """No exception element and no raw traceback on the page."""
    assert not at.exception, [e.value for e in at.exception]


@pytest.fixture
def x64():
    """Run one test in float64, then restore the previous setting."""
    import jax  # here, not at the top: conftest sets JAX's environment before anything imports it

    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)


@pytest.fixture
def page():
    return open_page


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for all browser tests: Playwright's sync API allows one per thread."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    from benchmarks.browser import launch

    with sync_api.sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


@pytest.fixture
def browser_page(browser, request):
    """A page in a browser context of its own (no cookies or storage from another test), sized to the test module's
    `VIEWPORT`."""
    context = browser.new_context(viewport=request.module.VIEWPORT)
    yield context.new_page()
    context.close()


#: Library and page tests of the quick subset that take over ~3 s from an empty compile cache on 2 cores: they run in
#: the whole suite only, so that `-m "not slow"` stays an inner loop (measured: benchmarks/RESULTS.md#test-suite).
#: The library code they reach keeps a faster quick test; the Privacy audit and Influence pages and the restart are
#: checked by the whole suite only.
WHOLE_SUITE_ONLY = {
    "test_audit.py": ["test_microbatch_bug_is_caught", "test_input_canary_audit_is_sound",
                      "test_planted_bug_is_caught[noise divided by the batch size twice]"],
    "test_cli.py": ["test_influence_columns_are_the_library_scores", "test_dp_sgd_npz_epsilon_from_the_accountant"],
    "test_code_panels.py": ["test_privacy_audit_panel", "test_geometry_panel", "test_equivalence_panel",
                            "test_norms_panel"],
    "test_data_train.py": ["test_adam_linear_is_optax_adam_on_a_linear_schedule_and_tracin_sees_the_decayed_rate"],
    "test_engine.py": ["test_auto_times_both_paths_once_and_stays_exact", "test_streamed_reductions_equal_materialized[mlp]",
                       "test_per_example_grads_match_python_loop[mlp]"],
    "test_engine_ghost.py": ["test_rules_equal_the_loop_on_every_model[cnn]",
                             "test_a_penalty_inside_the_loss_adds_one_gradient_to_every_example",
                             "test_rules_equal_the_loop_on_every_model[mlp-relu-2]"],
    "test_engine_precision.py": ["test_low_precision_matches_the_loop_and_clipped_norms_stay_below_c[mixed_precision-vmap]",
                                 "test_low_precision_matches_the_loop_and_clipped_norms_stay_below_c[bf16_params-auto]"],
    "test_engine_zoo.py": ["test_every_engine_function_matches_a_loop_of_grad[conv_zoo]",
                           "test_every_engine_function_matches_a_loop_of_grad[simple_cnn_zoo]",
                           "test_every_engine_function_matches_a_loop_of_grad[control_flow_zoo]",
                           "test_every_engine_function_matches_a_loop_of_grad[tied_zoo]",
                           "test_every_engine_function_matches_a_loop_of_grad[transposed_conv_zoo]",
                           "test_every_engine_function_matches_a_loop_of_grad[gru_zoo]",
                           "test_every_engine_function_matches_a_loop_of_grad[nnx_mlp_zoo]",
                           "test_every_engine_function_matches_a_loop_of_grad[equinox_tokens_zoo]",
                           # the engine's own chunks at N = 256: floats_zoo (where XLA's miscompile showed) stays quick
                           "test_the_default_chunks_at_n_256_match_a_loop_of_grad[tied_zoo]",
                           "test_the_default_chunks_at_n_256_match_a_loop_of_grad[transposed_conv_zoo]"],
    "test_geometry.py": ["test_a_new_problem_brings_its_own_learning_rate_and_batch_size"],
    "test_equivalence.py": ["test_compare_all_is_compare_for_both_reductions_and_mean_vs_sum"],
    # every method through the protocol against its function, the LDS table over every method (~6–7 s each) and the
    # last layer's float64 loop (~4 s): test_a_method_registered_in_one_line_reaches_the_scores_and_the_lds keeps the
    # protocol's paths quick (session 42)
    "test_influence_methods.py": ["test_registry_scores_equal_the_functions_they_wrap",
                                  "test_lds_table_loops_over_the_registry",
                                  "test_last_layer_matches_a_loop_of_jax_grad_in_float64"],
    "test_influence.py": ["test_trak_with_full_projection_and_one_model_is_the_exact_after_kernel",
                          "test_subset_models_are_the_models_train_returns_on_each_subset",
                          "test_truncated_cg_of_many_test_points_is_each_points_own_solve[3]",
                          "test_self_influence_finds_a_planted_mislabel", "test_own_retraining_agrees_with_scipy",
                          "test_equinox_model_auto_switches_to_cg_with_a_note",
                          "test_predicted_loo_change_matches_actual_retraining"],  # brute force stays quick
    "test_pages_audit.py": ["test_membership_and_audit_render", "test_planted_bug_is_caught_on_the_page",
                           "test_bad_setting_is_a_message_not_a_traceback",
                           "test_a_second_visitor_sees_the_same_numbers_and_no_error"],
    "test_pages_dp.py": ["test_dp_page_clipping_controls"],
    "test_pages_equiv_perf.py": ["test_performance_page_sweep_and_controls"],
    "test_pages_fashion.py": ["test_the_training_button_trains_and_the_page_goes_on",
                             "test_norms_page_on_fashion_names_rows_by_their_fashion_mnist_index"],
    "test_pages_norms.py": ["test_norms_page_on_2d_and_regression_data", "test_impossible_settings_give_messages_not_tracebacks"],
    "test_practice_sandbox.py": ["test_endless_loop_is_stopped_by_the_cpu_or_wall_clock_limit"],  # burns its CPU limit
    "test_privacy.py": ["test_epsilon_curve_is_incremental_composition", "test_dp_sgd_noise_and_epsilon_per_checkpoint"],
    "test_restart.py": ["test_a_restarted_server_answers_its_first_visitor_from_disk"],
    "test_rooms.py": ["test_a_following_students_next_stays_with_the_lecturer_and_says_why"],  # ~5 s: three AppTests
    # the canary and Geometry cards and a trial row's link stay quick; the retried switch (~4 s: two pages) is whole-suite
    "test_pages_record.py": ["test_record_page_card_and_whole_picture",
                             "test_a_card_switch_the_browser_swallowed_is_made_again_with_its_state"],
    "test_robustness.py": ["test_memory_estimates_match_the_real_arrays",
                           "test_influence_and_performance_links_over_the_work_budget_are_refused"],
    "test_url.py": ["test_short_codes_work_and_a_bad_link_value_is_named_not_dropped_silently",
                    "test_shared_link_reproduces_the_norms_view_and_numbers"],
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.name in WHOLE_SUITE_ONLY.get(item.path.name, ()):
            item.add_marker(pytest.mark.slow)


#: Every browser test file's marks: slow (a real server and Chromium per test: the whole suite runs them,
#: `-m "not slow"` skips them), skipped without Debian's Chromium, and a long timeout.
BROWSER_MARKS = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"Debian's chromium is not installed at {CHROMIUM} "
                       "(apt-get install chromium); the browser tests need it"),
    pytest.mark.timeout(900),
]
