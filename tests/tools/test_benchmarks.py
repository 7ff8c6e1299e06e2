"""benchmarks/peers.py runs end to end on a tiny configuration: it prints its markdown table, reports a peer that
is not installed as skipped (with the command that installs it), writes its plot, and rewrites only the marked
block of the docs page. step_breakdown.py names its pieces, and hf_eval.py counts an epoch boundary as its docs say.
No timing is asserted: the benchmarks measure, the tests only check that they run and what they add up."""
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = '<!-- peers:begin -->', '<!-- peers:end -->'

# Ignite made unimportable in the benchmark's process: it must be reported as skipped, never left out silently.
RUN_WITHOUT_IGNITE = ('import runpy, sys\n'
                      'sys.modules["ignite"] = None\n'
                      'sys.argv = ["peers.py"] + sys.argv[1:]\n'
                      f'runpy.run_path({str(ROOT / "benchmarks" / "peers.py")!r}, run_name="__main__")\n')


def test_the_peers_benchmark_prints_its_table_writes_its_plot_and_rewrites_only_the_marked_block(tmp_path):
    docs = tmp_path / 'performance.md'
    docs.write_text(f'# Performance\n\nBefore.\n\n{BEGIN}\nold figures\n{END}\n\nAfter.\n')
    image = tmp_path / 'images' / 'loop-overhead.png'
    process = subprocess.run(
        [sys.executable, '-c', RUN_WITHOUT_IGNITE, '--models', 'tiny', '--peers', 'trainloop,ignite', '--repeats', '2',
         '--warmup', '0', '--batches', '3', '--epochs', '1', '--quiet', '--write-docs', '--docs', str(docs),
         '--image', str(image)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stdout + process.stderr
    out = process.stdout
    assert '| x hand-written loop, steps/s | fed | whole fit | steady state |' in out
    assert '| hand-written loop, again (noise floor) | list |' in out
    assert '| aitoolbox_like TrainLoop | list |' in out
    assert '| PyTorch Ignite | list | skipped |' in out
    assert 'skipped: PyTorch Ignite: pip install pytorch-ignite' in out
    # the variants that ran trained the same weights as the hand-written loop (the last column), in the table of the
    # default path (first: the TrainLoop with a validation loader and nothing else, against the hand-written loop that
    # validates once per epoch) and the like-for-like one
    assert '| x the hand-written loop validating once per epoch, whole fit |' in out
    assert out.index('validating once per epoch, whole fit') < out.index('| x hand-written loop, steps/s |')
    assert [line.rsplit('|', 2)[1].strip() for line in out.splitlines()
            if line.startswith(('| hand-written loop validating once per epoch, again', '| aitoolbox_like TrainLoop, '
                                "its defaults", '| aitoolbox_like TrainLoop, eval_train_set=True'))] == ['0', '0', '0']
    assert [line.rsplit('|', 2)[1].strip() for line in out.splitlines()
            if line.startswith(('| hand-written loop, again', '| aitoolbox_like TrainLoop |'))] == ['0', '0']
    assert image.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    text = docs.read_text()
    assert text.startswith('# Performance\n\nBefore.\n\n' + BEGIN) and text.endswith(END + '\n\nAfter.\n')
    assert 'old figures' not in text and '| aitoolbox_like TrainLoop | list |' in text
    assert '](images/loop-overhead.png)' in text and 'Skipped: PyTorch Ignite:' in text


def test_the_docs_page_has_the_block_the_benchmark_rewrites_and_the_plot_it_shows():
    text = (ROOT / 'docs' / 'performance.md').read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and text.index(BEGIN) < text.index(END)
    block = text[text.index(BEGIN):text.index(END)]
    assert '](images/loop-overhead.png)' in block and (ROOT / 'docs' / 'images' / 'loop-overhead.png').is_file()


def test_the_step_breakdown_names_every_piece_and_sets_their_sum_beside_the_whole_step():
    process = subprocess.run([sys.executable, str(ROOT / 'benchmarks' / 'step_breakdown.py'), '--number', '400',
                              '--repeats', '1'], capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stdout + process.stderr
    names = [line.rsplit('  ', 1)[0].strip() for line in process.stdout.splitlines()[1:]]
    assert names == ['batch taken: _batches generator and loop.iteration/batch/_is_last_batch',
                     'bookkeeping: iteration counter, update reset, 2 hook dispatches, the step call, last-batch test',
                     'update decision: _is_update_step()', 'DDP and autocast contexts (no-ops)',
                     'TTBasicModel.get_loss around the forward: unpack, device checks',
                     'loss kept: loop.loss, on_after_loss dispatch, detach and append',
                     'backward() around loss.backward(): accumulation and scaler checks, hook dispatch',
                     'optimizer update around step() and zero_grad(): applied flags, skip decision, hook dispatches',
                     'sum of the pieces', 'whole step over the raw step (tiny MLP, batches of 32)']
    assert all(line.endswith(' us') for line in process.stdout.splitlines()[1:])


def test_an_epoch_boundary_costs_the_time_between_epochs_and_what_the_next_steps_take_beyond_the_usual():
    # hf_eval's figure: a background write's time shows in the steps after the boundary, not between the epochs.
    spec = importlib.util.spec_from_file_location('hf_eval', ROOT / 'benchmarks' / 'hf_eval.py')
    hf_eval = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf_eval)
    marks = hf_eval.Boundaries()
    # Each epoch: its start, then each step's end (seconds). Steps take 1 s, except the first two after a boundary
    # (3 s and 2 s: 3 s more than usual in all), and 3 s pass between the epochs.
    marks.epochs = [[0, 1, 2, 3, 4], [7, 10, 12, 13, 14], [17, 20, 22, 23, 24]]
    assert marks.cost() == (3, 3)
