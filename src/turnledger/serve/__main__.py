from ._server import main

main()
