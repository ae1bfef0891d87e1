from runroute.cli import app

app()
