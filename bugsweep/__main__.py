from bugsweep.cli import main

main()
