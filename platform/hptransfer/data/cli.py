"""`hpt data prepare SPEC`: tokenize the spec's files once into memory-mapped token files."""

from __future__ import annotations

from pathlib import Path

import typer

from hptransfer.console import say, user_errors

app = typer.Typer(
    help="Your corpus: tokenize local files once (sweep trials and large-run workers read the result).", no_args_is_help=True
)


@app.command()
@user_errors
def prepare(
    spec: Path = typer.Argument(..., help="Study spec YAML with data.corpus: files."),
    force: bool = typer.Option(False, "--force", help="Prepare again even if inputs and tokenizer are unchanged."),
):
    """Read data.paths through Hugging Face `datasets`, tokenize with data.tokenizer, split train/validation
    by a stable hash of each document, and write token files with a manifest (input hashes, tokenizer
    hash, token counts) under data.cache_dir. Reused while inputs and tokenizer are unchanged; checks
    the corpus is large enough for the sweep and the target run. Training prepares on first use too."""
    from hptransfer.data import TokenCorpus, check_size
    from hptransfer.data import prepare as prepare_data
    from hptransfer.env import configure
    from hptransfer.spec import load_spec

    configure()
    s = load_spec(spec)
    if s.data.corpus != "files":
        say(f"{spec}: data.corpus is {s.data.corpus!r}; nothing to prepare (it is read in memory)")
        return
    p = prepare_data(s.data, force=force, log=say)
    corpus = TokenCorpus.open(p.folder, p.manifest)
    check_size(
        corpus, s.data, seq_len=s.model.seq_len, steps=s.sweep.steps, batch_size=s.sweep.batch_size, what="each sweep trial"
    )
    check_size(
        corpus, s.data, seq_len=s.model.seq_len, steps=s.target_steps, batch_size=s.target_batch_size, what="the target run"
    )
    m = p.manifest
    say(f"{'reused' if p.reused else 'prepared'} {p.folder}")
    say(
        f"  {len(m['inputs'])} file(s), documents train/val {m['documents']['train']:,}/{m['documents']['val']:,}, "
        f"tokens train/val {m['tokens']['train']:,}/{m['tokens']['val']:,} ({m['dtype']})"
    )
    say(
        f"  tokenizer {m['tokenizer']['name']} (vocabulary {m['tokenizer']['vocab_size']:,}, "
        f"sha256 {m['tokenizer']['sha256'][:12]})"
    )
