"""sattrib command line (temporary minimal version)."""
import sys
import click
from pathlib import Path


@click.group()
def main():
    pass


@main.command()
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True)
def analyze(folder, as_json):
    from .analysis import analyze_folder
    d, _ = analyze_folder(folder)
    click.echo(d.model_dump_json(indent=2))
