from hptransfer.cli import app

app(prog_name="hpt")
