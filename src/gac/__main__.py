from gac.cli import main

main()
