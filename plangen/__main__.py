from plangen.cli import main

main()
