from bhyt_pl.cli import main

if __name__ == "__main__":
    result = main()
    if isinstance(result, int):
        raise SystemExit(result)
